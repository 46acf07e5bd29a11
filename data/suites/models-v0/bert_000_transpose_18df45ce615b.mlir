module {
  func.func @layer(%arg0: tensor<768x768xf32>) -> tensor<768x768xf32> {
    %0 = tensor.empty() : tensor<768x768xf32>
    %transposed = linalg.transpose ins(%arg0 : tensor<768x768xf32>) outs(%0 : tensor<768x768xf32>) permutation = [1, 0] 
    return %transposed : tensor<768x768xf32>
  }
}
