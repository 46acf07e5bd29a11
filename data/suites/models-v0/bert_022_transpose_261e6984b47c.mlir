module {
  func.func @layer(%arg0: tensor<768x3072xf32>) -> tensor<3072x768xf32> {
    %0 = tensor.empty() : tensor<3072x768xf32>
    %transposed = linalg.transpose ins(%arg0 : tensor<768x3072xf32>) outs(%0 : tensor<3072x768xf32>) permutation = [1, 0] 
    return %transposed : tensor<3072x768xf32>
  }
}
