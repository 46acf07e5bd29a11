module {
  func.func @layer(%arg0: tensor<1000x512xf32>) -> tensor<512x1000xf32> {
    %0 = tensor.empty() : tensor<512x1000xf32>
    %transposed = linalg.transpose ins(%arg0 : tensor<1000x512xf32>) outs(%0 : tensor<512x1000xf32>) permutation = [1, 0] 
    return %transposed : tensor<512x1000xf32>
  }
}
