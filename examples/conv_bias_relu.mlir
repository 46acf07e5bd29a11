// relu(conv2d(I, W) + bias): a 3x3 NHWC convolution feeding a bias-add-ReLU generic.
#nhwc = affine_map<(n, h, w, f) -> (n, h, w, f)>
#bias = affine_map<(n, h, w, f) -> (f)>
func.func @conv_bias_relu(%I: tensor<1x30x30x64xf32>, %W: tensor<3x3x64x96xf32>,
                          %b: tensor<96xf32>) -> tensor<1x28x28x96xf32> {
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<1x28x28x96xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%empty : tensor<1x28x28x96xf32>) -> tensor<1x28x28x96xf32>
  %conv = linalg.conv_2d_nhwc_hwcf {dilations = dense<1> : tensor<2xi64>, strides = dense<1> : tensor<2xi64>}
          ins(%I, %W : tensor<1x30x30x64xf32>, tensor<3x3x64x96xf32>)
          outs(%acc : tensor<1x28x28x96xf32>) -> tensor<1x28x28x96xf32>
  %out = tensor.empty() : tensor<1x28x28x96xf32>
  %r = linalg.generic {indexing_maps = [#nhwc, #bias, #nhwc],
                       iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
       ins(%conv, %b : tensor<1x28x28x96xf32>, tensor<96xf32>) outs(%out : tensor<1x28x28x96xf32>) {
  ^bb0(%x: f32, %bias: f32, %o: f32):
    %s = arith.addf %x, %bias : f32
    %m = arith.maximumf %s, %zero : f32
    linalg.yield %m : f32
  } -> tensor<1x28x28x96xf32>
  return %r : tensor<1x28x28x96xf32>
}
