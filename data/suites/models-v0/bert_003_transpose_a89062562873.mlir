module {
  func.func @layer(%arg0: tensor<1x128x12x64xf32>) -> tensor<1x12x64x128xf32> {
    %0 = tensor.empty() : tensor<1x12x64x128xf32>
    %transposed = linalg.transpose ins(%arg0 : tensor<1x128x12x64xf32>) outs(%0 : tensor<1x12x64x128xf32>) permutation = [0, 2, 3, 1] 
    return %transposed : tensor<1x12x64x128xf32>
  }
}
