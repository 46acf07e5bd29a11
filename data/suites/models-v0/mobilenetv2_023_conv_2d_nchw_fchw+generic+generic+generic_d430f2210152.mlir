#map = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>
#map1 = affine_map<(d0, d1, d2, d3) -> (d1, 0, 0)>
module {
  func.func @layer(%arg0: tensor<1x144x28x28xf32>, %arg1: tensor<32x144x1x1xf32>, %arg2: tensor<32x1x1xf32>, %arg3: tensor<32x1x1xf32>, %arg4: tensor<32x1x1xf32>) -> tensor<1x32x28x28xf32> {
    %cst = arith.constant 0.000000e+00 : f32
    %0 = tensor.empty() : tensor<1x32x28x28xf32>
    %1 = linalg.fill ins(%cst : f32) outs(%0 : tensor<1x32x28x28xf32>) -> tensor<1x32x28x28xf32>
    %2 = linalg.conv_2d_nchw_fchw {dilations = dense<1> : vector<2xi64>, strides = dense<1> : vector<2xi64>} ins(%arg0, %arg1 : tensor<1x144x28x28xf32>, tensor<32x144x1x1xf32>) outs(%1 : tensor<1x32x28x28xf32>) -> tensor<1x32x28x28xf32>
    %3 = linalg.generic {indexing_maps = [#map, #map1, #map], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%2, %arg2 : tensor<1x32x28x28xf32>, tensor<32x1x1xf32>) outs(%0 : tensor<1x32x28x28xf32>) {
    ^bb0(%in: f32, %in_0: f32, %out: f32):
      %6 = arith.subf %in, %in_0 : f32
      linalg.yield %6 : f32
    } -> tensor<1x32x28x28xf32>
    %4 = linalg.generic {indexing_maps = [#map, #map1, #map], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%3, %arg3 : tensor<1x32x28x28xf32>, tensor<32x1x1xf32>) outs(%0 : tensor<1x32x28x28xf32>) {
    ^bb0(%in: f32, %in_0: f32, %out: f32):
      %6 = arith.mulf %in, %in_0 : f32
      linalg.yield %6 : f32
    } -> tensor<1x32x28x28xf32>
    %5 = linalg.generic {indexing_maps = [#map, #map1, #map], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%4, %arg4 : tensor<1x32x28x28xf32>, tensor<32x1x1xf32>) outs(%0 : tensor<1x32x28x28xf32>) {
    ^bb0(%in: f32, %in_0: f32, %out: f32):
      %6 = arith.mulf %in, %in_0 : f32
      linalg.yield %6 : f32
    } -> tensor<1x32x28x28xf32>
    return %5 : tensor<1x32x28x28xf32>
  }
}
