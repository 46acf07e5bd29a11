#map = affine_map<(d0, d1, d2) -> (d0, d1, d2)>
module {
  func.func @layer(%arg0: tensor<1x128x768xf64>) -> tensor<1x128x768xf64> {
    %0 = tensor.empty() : tensor<1x128x768xf64>
    %1 = linalg.generic {indexing_maps = [#map, #map, #map], iterator_types = ["parallel", "parallel", "parallel"]} ins(%arg0, %arg0 : tensor<1x128x768xf64>, tensor<1x128x768xf64>) outs(%0 : tensor<1x128x768xf64>) {
    ^bb0(%in: f64, %in_0: f64, %out: f64):
      %2 = arith.mulf %in, %in_0 : f64
      linalg.yield %2 : f64
    } -> tensor<1x128x768xf64>
    return %1 : tensor<1x128x768xf64>
  }
}
