#map = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>
#map1 = affine_map<(d0, d1, d2, d3) -> (d1, 0, 0)>
module {
  func.func @layer(%arg0: tensor<1x32x28x28xf32>, %arg1: tensor<32x1x1xf32>, %arg2: tensor<1x32x28x28xf32>) -> tensor<1x32x28x28xf32> {
    %0 = tensor.empty() : tensor<1x32x28x28xf32>
    %1 = linalg.generic {indexing_maps = [#map, #map1, #map], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%arg0, %arg1 : tensor<1x32x28x28xf32>, tensor<32x1x1xf32>) outs(%0 : tensor<1x32x28x28xf32>) {
    ^bb0(%in: f32, %in_0: f32, %out: f32):
      %3 = arith.addf %in, %in_0 : f32
      linalg.yield %3 : f32
    } -> tensor<1x32x28x28xf32>
    %2 = linalg.generic {indexing_maps = [#map, #map, #map], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%arg2, %1 : tensor<1x32x28x28xf32>, tensor<1x32x28x28xf32>) outs(%0 : tensor<1x32x28x28xf32>) {
    ^bb0(%in: f32, %in_0: f32, %out: f32):
      %3 = arith.addf %in, %in_0 : f32
      linalg.yield %3 : f32
    } -> tensor<1x32x28x28xf32>
    return %2 : tensor<1x32x28x28xf32>
  }
}
