#map = affine_map<(d0) -> (d0)>
module {
  func.func @layer(%arg0: tensor<144xf32>) -> tensor<144xf32> {
    %cst = arith.constant 0.000000e+00 : f32
    %cst_0 = arith.constant 1.000000e+00 : f32
    %cst_1 = arith.constant 1.000000e-05 : f64
    %0 = tensor.empty() : tensor<144xf32>
    %1 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel"]} ins(%arg0 : tensor<144xf32>) outs(%0 : tensor<144xf32>) {
    ^bb0(%in: f32, %out: f32):
      %4 = arith.truncf %cst_1 : f64 to f32
      %5 = arith.addf %in, %4 : f32
      linalg.yield %5 : f32
    } -> tensor<144xf32>
    %2 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel"]} ins(%1 : tensor<144xf32>) outs(%0 : tensor<144xf32>) {
    ^bb0(%in: f32, %out: f32):
      %4 = math.sqrt %in : f32
      linalg.yield %4 : f32
    } -> tensor<144xf32>
    %3 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel"]} ins(%2 : tensor<144xf32>) outs(%0 : tensor<144xf32>) {
    ^bb0(%in: f32, %out: f32):
      %4 = arith.cmpf one, %in, %cst : f32
      %5 = arith.divf %cst_0, %in : f32
      linalg.yield %5 : f32
    } -> tensor<144xf32>
    return %3 : tensor<144xf32>
  }
}
