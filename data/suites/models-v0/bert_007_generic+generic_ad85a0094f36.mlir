#map = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>
#map1 = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, 0)>
module {
  func.func @layer(%arg0: tensor<1x12x128x128xf32>, %arg1: tensor<1x12x128x1xf32>) -> tensor<1x12x128x128xf32> {
    %0 = tensor.empty() : tensor<1x12x128x128xf32>
    %1 = linalg.generic {indexing_maps = [#map, #map1, #map], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%arg0, %arg1 : tensor<1x12x128x128xf32>, tensor<1x12x128x1xf32>) outs(%0 : tensor<1x12x128x128xf32>) {
    ^bb0(%in: f32, %in_0: f32, %out: f32):
      %3 = arith.subf %in, %in_0 : f32
      linalg.yield %3 : f32
    } -> tensor<1x12x128x128xf32>
    %2 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%1 : tensor<1x12x128x128xf32>) outs(%0 : tensor<1x12x128x128xf32>) {
    ^bb0(%in: f32, %out: f32):
      %3 = math.exp %in : f32
      linalg.yield %3 : f32
    } -> tensor<1x12x128x128xf32>
    return %2 : tensor<1x12x128x128xf32>
  }
}
