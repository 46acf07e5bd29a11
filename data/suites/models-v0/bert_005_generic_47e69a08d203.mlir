#map = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>
module {
  func.func @layer(%arg0: tensor<1x12x128x128xf32>) -> tensor<1x12x128x128xf32> {
    %cst = arith.constant 8.000000e+00 : f32
    %0 = tensor.empty() : tensor<1x12x128x128xf32>
    %1 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%arg0 : tensor<1x12x128x128xf32>) outs(%0 : tensor<1x12x128x128xf32>) {
    ^bb0(%in: f32, %out: f32):
      %2 = arith.divf %in, %cst : f32
      linalg.yield %2 : f32
    } -> tensor<1x12x128x128xf32>
    return %1 : tensor<1x12x128x128xf32>
  }
}
