#map = affine_map<(d0, d1, d2) -> (d0, d1, d2)>
#map1 = affine_map<(d0, d1, d2) -> (d0, d1, 0)>
module {
  func.func @layer(%arg0: tensor<1x128x768xf64>) -> tensor<1x128x1xf32> {
    %cst = arith.constant 0.000000e+00 : f64
    %cst_0 = arith.constant 1.000000e-05 : f64
    %cst_1 = arith.constant 7.680000e+02 : f64
    %0 = tensor.empty() : tensor<1x128x1xf64>
    %1 = linalg.fill ins(%cst : f64) outs(%0 : tensor<1x128x1xf64>) -> tensor<1x128x1xf64>
    %2 = tensor.empty() : tensor<1x128x1xf32>
    %3 = linalg.generic {indexing_maps = [#map, #map1], iterator_types = ["parallel", "parallel", "reduction"]} ins(%arg0 : tensor<1x128x768xf64>) outs(%1 : tensor<1x128x1xf64>) {
    ^bb0(%in: f64, %out: f64):
      %7 = arith.addf %in, %out : f64
      linalg.yield %7 : f64
    } -> tensor<1x128x1xf64>
    %4 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel", "parallel"]} ins(%3 : tensor<1x128x1xf64>) outs(%0 : tensor<1x128x1xf64>) {
    ^bb0(%in: f64, %out: f64):
      %7 = arith.divf %in, %cst_1 : f64
      linalg.yield %7 : f64
    } -> tensor<1x128x1xf64>
    %5 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel", "parallel"]} ins(%4 : tensor<1x128x1xf64>) outs(%2 : tensor<1x128x1xf32>) {
    ^bb0(%in: f64, %out: f32):
      %7 = arith.truncf %in : f64 to f32
      linalg.yield %7 : f32
    } -> tensor<1x128x1xf32>
    %6 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel", "parallel"]} ins(%5 : tensor<1x128x1xf32>) outs(%2 : tensor<1x128x1xf32>) {
    ^bb0(%in: f32, %out: f32):
      %7 = arith.truncf %cst_0 : f64 to f32
      %8 = arith.addf %in, %7 : f32
      linalg.yield %8 : f32
    } -> tensor<1x128x1xf32>
    return %6 : tensor<1x128x1xf32>
  }
}
