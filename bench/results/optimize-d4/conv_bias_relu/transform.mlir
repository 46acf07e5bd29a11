module attributes {transform.with_named_sequence} {
  transform.named_sequence @__transform_main(%root: !transform.any_op {transform.readonly}) {
    %op1 = transform.structured.match attributes {mlirrl.op_id = 0 : i64} in %root : (!transform.any_op) -> !transform.any_op
    %op2 = transform.structured.match attributes {mlirrl.op_id = 1 : i64} in %root : (!transform.any_op) -> !transform.any_op
    %op3 = transform.structured.match attributes {mlirrl.op_id = 2 : i64} in %root : (!transform.any_op) -> !transform.any_op
    %t4, %loop5 = transform.structured.tile_using_for %op3 tile_sizes [0, 0, 0, 32] : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
    %t6, %loop7, %loop8 = transform.structured.tile_using_for %t4 tile_sizes [0, 1, 7, 0] : (!transform.any_op) -> (!transform.any_op, !transform.any_op, !transform.any_op)
    transform.structured.vectorize %t6 : !transform.any_op
    %t9, %loop10 = transform.structured.tile_using_for %op2 tile_sizes [0, 0, 0, 32, 0, 0, 0] : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
    %t11, %loop12, %loop13, %loop14, %loop15, %loop16 = transform.structured.tile_using_for %t9 tile_sizes [0, 1, 7, 0, 1, 1, 1] : (!transform.any_op) -> (!transform.any_op, !transform.any_op, !transform.any_op, !transform.any_op, !transform.any_op, !transform.any_op)
    %d17 = transform.structured.decompose %t11 : (!transform.any_op) -> !transform.any_op
    transform.structured.vectorize %d17 : !transform.any_op
    %func18 = transform.structured.match ops{["func.func"]} in %root : (!transform.any_op) -> !transform.any_op
    transform.apply_patterns to %func18 {
      transform.apply_patterns.vector.transfer_permutation_patterns
      transform.apply_patterns.vector.reduction_to_contract
      transform.apply_patterns.canonicalization
    } : !transform.any_op
    transform.apply_patterns to %func18 {
      transform.apply_patterns.vector.lower_contraction lowering_strategy = "outerproduct"
      transform.apply_patterns.vector.lower_multi_reduction lowering_strategy = "innerparallel"
      transform.apply_patterns.canonicalization
    } : !transform.any_op
    transform.apply_patterns to %func18 {
      transform.apply_patterns.vector.lower_outerproduct
      transform.apply_patterns.canonicalization
    } : !transform.any_op
    transform.loop.hoist_loop_invariant_subsets %loop16 : !transform.any_op
    transform.loop.hoist_loop_invariant_subsets %loop15 : !transform.any_op
    transform.loop.hoist_loop_invariant_subsets %loop14 : !transform.any_op
    transform.loop.hoist_loop_invariant_subsets %loop13 : !transform.any_op
    transform.loop.hoist_loop_invariant_subsets %loop12 : !transform.any_op
    transform.loop.hoist_loop_invariant_subsets %loop10 : !transform.any_op
    transform.loop.hoist_loop_invariant_subsets %loop8 : !transform.any_op
    transform.loop.hoist_loop_invariant_subsets %loop7 : !transform.any_op
    transform.loop.hoist_loop_invariant_subsets %loop5 : !transform.any_op
    transform.yield
  }
}

