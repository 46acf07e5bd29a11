module attributes {transform.with_named_sequence} {
  transform.named_sequence @__transform_main(%root: !transform.any_op {transform.readonly}) {
    %op1 = transform.structured.match attributes {mlirrl.op_id = 0 : i64} in %root : (!transform.any_op) -> !transform.any_op
    %op2 = transform.structured.match attributes {mlirrl.op_id = 1 : i64} in %root : (!transform.any_op) -> !transform.any_op
    %t3, %loop4, %loop5, %loop6, %loop7, %loop8, %loop9, %loop10 = transform.structured.tile_using_for %op2 tile_sizes [1, 8, 2, 8, 6, 1, 2] : (!transform.any_op) -> (!transform.any_op, !transform.any_op, !transform.any_op, !transform.any_op, !transform.any_op, !transform.any_op, !transform.any_op, !transform.any_op)
    transform.structured.vectorize %t3 : !transform.any_op
    %t11, %forall12 = transform.structured.tile_using_forall %op1 tile_sizes [1, 8, 5, 8] : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
    transform.structured.vectorize %t11 : !transform.any_op
    %func13 = transform.structured.match ops{["func.func"]} in %root : (!transform.any_op) -> !transform.any_op
    transform.apply_patterns to %func13 {
      transform.apply_patterns.vector.transfer_permutation_patterns
      transform.apply_patterns.vector.reduction_to_contract
      transform.apply_patterns.canonicalization
    } : !transform.any_op
    transform.apply_patterns to %func13 {
      transform.apply_patterns.vector.lower_contraction lowering_strategy = "outerproduct"
      transform.apply_patterns.vector.lower_multi_reduction lowering_strategy = "innerparallel"
      transform.apply_patterns.canonicalization
    } : !transform.any_op
    transform.apply_patterns to %func13 {
      transform.apply_patterns.vector.lower_outerproduct
      transform.apply_patterns.canonicalization
    } : !transform.any_op
    transform.loop.hoist_loop_invariant_subsets %loop10 : !transform.any_op
    transform.loop.hoist_loop_invariant_subsets %loop9 : !transform.any_op
    transform.loop.hoist_loop_invariant_subsets %loop8 : !transform.any_op
    transform.loop.hoist_loop_invariant_subsets %loop7 : !transform.any_op
    transform.loop.hoist_loop_invariant_subsets %loop6 : !transform.any_op
    transform.loop.hoist_loop_invariant_subsets %loop5 : !transform.any_op
    transform.loop.hoist_loop_invariant_subsets %loop4 : !transform.any_op
    transform.yield
  }
}

