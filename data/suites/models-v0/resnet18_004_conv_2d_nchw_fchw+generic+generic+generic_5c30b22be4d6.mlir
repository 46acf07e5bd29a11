#map = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>
#map1 = affine_map<(d0, d1, d2, d3) -> (d1, 0, 0)>
module {
  func.func @layer(%arg0: tensor<1x64x58x58xf32>, %arg1: tensor<64x64x3x3xf32>, %arg2: tensor<64x1x1xf32>, %arg3: tensor<64x1x1xf32>, %arg4: tensor<64x1x1xf32>) -> tensor<1x64x56x56xf32> {
    %cst = arith.constant 0.000000e+00 : f32
    %0 = tensor.empty() : tensor<1x64x56x56xf32>
    %1 = linalg.fill ins(%cst : f32) outs(%0 : tensor<1x64x56x56xf32>) -> tensor<1x64x56x56xf32>
    %2 = linalg.conv_2d_nchw_fchw {dilations = dense<1> : vector<2xi64>, strides = dense<1> : vector<2xi64>} ins(%arg0, %arg1 : tensor<1x64x58x58xf32>, tensor<64x64x3x3xf32>) outs(%1 : tensor<1x64x56x56xf32>) -> tensor<1x64x56x56xf32>
    %3 = linalg.generic {indexing_maps = [#map, #map1, #map], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%2, %arg2 : tensor<1x64x56x56xf32>, tensor<64x1x1xf32>) outs(%0 : tensor<1x64x56x56xf32>) {
    ^bb0(%in: f32, %in_0: f32, %out: f32):
      %6 = arith.subf %in, %in_0 : f32
      linalg.yield %6 : f32
    } -> tensor<1x64x56x56xf32>
    %4 = linalg.generic {indexing_maps = [#map, #map1, #map], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%3, %arg3 : tensor<1x64x56x56xf32>, tensor<64x1x1xf32>) outs(%0 : tensor<1x64x56x56xf32>) {
    ^bb0(%in: f32, %in_0: f32, %out: f32):
      %6 = arith.mulf %in, %in_0 : f32
      linalg.yield %6 : f32
    } -> tensor<1x64x56x56xf32>
    %5 = linalg.generic {indexing_maps = [#map, #map1, #map], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%4, %arg4 : tensor<1x64x56x56xf32>, tensor<64x1x1xf32>) outs(%0 : tensor<1x64x56x56xf32>) {
    ^bb0(%in: f32, %in_0: f32, %out: f32):
      %6 = arith.mulf %in, %in_0 : f32
      linalg.yield %6 : f32
    } -> tensor<1x64x56x56xf32>
    return %5 : tensor<1x64x56x56xf32>
  }
}
