// A 7-loop tensor contraction: C[a,b,c,d] = sum over e,f,g of A[a,e,b,f] * B[f,g,c,e] * D[g,d].
#A = affine_map<(a, b, c, d, e, f, g) -> (a, e, b, f)>
#B = affine_map<(a, b, c, d, e, f, g) -> (f, g, c, e)>
#D = affine_map<(a, b, c, d, e, f, g) -> (g, d)>
#C = affine_map<(a, b, c, d, e, f, g) -> (a, b, c, d)>
func.func @contraction7(%x: tensor<16x12x24x10xf32>, %y: tensor<10x8x10x12xf32>,
                        %z: tensor<8x16xf32>) -> tensor<16x24x10x16xf32> {
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<16x24x10x16xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%empty : tensor<16x24x10x16xf32>) -> tensor<16x24x10x16xf32>
  %r = linalg.generic {indexing_maps = [#A, #B, #D, #C],
                       iterator_types = ["parallel", "parallel", "parallel", "parallel",
                                         "reduction", "reduction", "reduction"]}
       ins(%x, %y, %z : tensor<16x12x24x10xf32>, tensor<10x8x10x12xf32>, tensor<8x16xf32>)
       outs(%acc : tensor<16x24x10x16xf32>) {
  ^bb0(%p: f32, %q: f32, %s: f32, %o: f32):
    %pq = arith.mulf %p, %q : f32
    %pqs = arith.mulf %pq, %s : f32
    %sum = arith.addf %o, %pqs : f32
    linalg.yield %sum : f32
  } -> tensor<16x24x10x16xf32>
  return %r : tensor<16x24x10x16xf32>
}
