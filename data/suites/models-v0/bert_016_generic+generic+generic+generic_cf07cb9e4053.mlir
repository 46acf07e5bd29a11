#map = affine_map<(d0, d1, d2) -> (d0, d1, d2)>
#map1 = affine_map<(d0, d1, d2) -> (d0, d1, 0)>
module {
  func.func @layer(%arg0: tensor<1x128x768xf32>, %arg1: tensor<1x128x1xf32>) -> tensor<1x128x768xf32> {
    %cst = arith.constant 0.000000e+00 : f32
    %cst_0 = arith.constant 7.680000e+02 : f32
    %0 = tensor.empty() : tensor<1x128x768xf32>
    %1 = tensor.empty() : tensor<1x128x1xf32>
    %2 = linalg.fill ins(%cst : f32) outs(%1 : tensor<1x128x1xf32>) -> tensor<1x128x1xf32>
    %3 = linalg.generic {indexing_maps = [#map, #map1], iterator_types = ["parallel", "parallel", "reduction"]} ins(%arg0 : tensor<1x128x768xf32>) outs(%2 : tensor<1x128x1xf32>) {
    ^bb0(%in: f32, %out: f32):
      %7 = arith.addf %in, %out : f32
      linalg.yield %7 : f32
    } -> tensor<1x128x1xf32>
    %4 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel", "parallel"]} ins(%3 : tensor<1x128x1xf32>) outs(%1 : tensor<1x128x1xf32>) {
    ^bb0(%in: f32, %out: f32):
      %7 = arith.divf %in, %cst_0 : f32
      linalg.yield %7 : f32
    } -> tensor<1x128x1xf32>
    %5 = linalg.generic {indexing_maps = [#map, #map1, #map], iterator_types = ["parallel", "parallel", "parallel"]} ins(%arg0, %4 : tensor<1x128x768xf32>, tensor<1x128x1xf32>) outs(%0 : tensor<1x128x768xf32>) {
    ^bb0(%in: f32, %in_1: f32, %out: f32):
      %7 = arith.subf %in, %in_1 : f32
      linalg.yield %7 : f32
    } -> tensor<1x128x768xf32>
    %6 = linalg.generic {indexing_maps = [#map, #map1, #map], iterator_types = ["parallel", "parallel", "parallel"]} ins(%5, %arg1 : tensor<1x128x768xf32>, tensor<1x128x1xf32>) outs(%0 : tensor<1x128x768xf32>) {
    ^bb0(%in: f32, %in_1: f32, %out: f32):
      %7 = arith.mulf %in, %in_1 : f32
      linalg.yield %7 : f32
    } -> tensor<1x128x768xf32>
    return %6 : tensor<1x128x768xf32>
  }
}
