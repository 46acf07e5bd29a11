#map = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>
#map1 = affine_map<(d0, d1, d2, d3) -> (d1, 0, 0)>
#map2 = affine_map<(d0, d1, d2, d3) -> ()>
module {
  func.func @layer(%arg0: tensor<1x576x14x14xf32>, %arg1: tensor<576x1x1xf32>, %arg2: tensor<f32>, %arg3: tensor<f32>) -> tensor<1x576x14x14xf32> {
    %0 = tensor.empty() : tensor<1x576x14x14xf32>
    %1 = linalg.generic {indexing_maps = [#map, #map1, #map], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%arg0, %arg1 : tensor<1x576x14x14xf32>, tensor<576x1x1xf32>) outs(%0 : tensor<1x576x14x14xf32>) {
    ^bb0(%in: f32, %in_0: f32, %out: f32):
      %4 = arith.addf %in, %in_0 : f32
      linalg.yield %4 : f32
    } -> tensor<1x576x14x14xf32>
    %2 = linalg.generic {indexing_maps = [#map, #map2, #map], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%1, %arg2 : tensor<1x576x14x14xf32>, tensor<f32>) outs(%0 : tensor<1x576x14x14xf32>) {
    ^bb0(%in: f32, %in_0: f32, %out: f32):
      %4 = arith.cmpf ogt, %in, %in_0 : f32
      %5 = arith.select %4, %in, %in_0 : f32
      linalg.yield %5 : f32
    } -> tensor<1x576x14x14xf32>
    %3 = linalg.generic {indexing_maps = [#map2, #map, #map], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%arg3, %2 : tensor<f32>, tensor<1x576x14x14xf32>) outs(%0 : tensor<1x576x14x14xf32>) {
    ^bb0(%in: f32, %in_0: f32, %out: f32):
      %4 = arith.cmpf olt, %in, %in_0 : f32
      %5 = arith.select %4, %in, %in_0 : f32
      linalg.yield %5 : f32
    } -> tensor<1x576x14x14xf32>
    return %3 : tensor<1x576x14x14xf32>
  }
}
