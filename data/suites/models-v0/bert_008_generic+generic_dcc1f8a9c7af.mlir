#map = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>
#map1 = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, 0)>
module {
  func.func @layer(%arg0: tensor<1x12x128x128xf32>) -> tensor<1x12x128x128xf32> {
    %cst = arith.constant 0.000000e+00 : f32
    %0 = tensor.empty() : tensor<1x12x128x128xf32>
    %1 = tensor.empty() : tensor<1x12x128x1xf32>
    %2 = linalg.fill ins(%cst : f32) outs(%1 : tensor<1x12x128x1xf32>) -> tensor<1x12x128x1xf32>
    %3 = linalg.generic {indexing_maps = [#map, #map1], iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%arg0 : tensor<1x12x128x128xf32>) outs(%2 : tensor<1x12x128x1xf32>) {
    ^bb0(%in: f32, %out: f32):
      %5 = arith.addf %in, %out : f32
      linalg.yield %5 : f32
    } -> tensor<1x12x128x1xf32>
    %4 = linalg.generic {indexing_maps = [#map, #map1, #map], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%arg0, %3 : tensor<1x12x128x128xf32>, tensor<1x12x128x1xf32>) outs(%0 : tensor<1x12x128x128xf32>) {
    ^bb0(%in: f32, %in_0: f32, %out: f32):
      %5 = arith.divf %in, %in_0 : f32
      linalg.yield %5 : f32
    } -> tensor<1x12x128x128xf32>
    return %4 : tensor<1x12x128x128xf32>
  }
}
