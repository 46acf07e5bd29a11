// A matmul on tensors, written by hand: C = A x B with a zero-filled accumulator.
func.func @matmul(%A: tensor<192x320xf32>, %B: tensor<320x256xf32>) -> tensor<192x256xf32> {
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<192x256xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%empty : tensor<192x256xf32>) -> tensor<192x256xf32>
  %C = linalg.matmul ins(%A, %B : tensor<192x320xf32>, tensor<320x256xf32>)
                     outs(%acc : tensor<192x256xf32>) -> tensor<192x256xf32>
  return %C : tensor<192x256xf32>
}
