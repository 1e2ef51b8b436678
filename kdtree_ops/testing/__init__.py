"""What the tests, the demo and the benchmark share, apart from the library: float64 references of the verify
ops (`reference`), random verify inputs (`cases`), draft-tree utilities (`trees`), and toy models (`toy_model`,
`toy_target` with a built-in greedy margin, `toy_drafter`'s block drafter)."""
