"""Which draft shape each speculative step runs: the policy protocol and its fixed shape, the
adaptive policy, the acceptance it learns per temperature band, and the step costs it prices
them with (measured at start, corrected as the engine runs)."""
