"""The `eagletree` command line: the parser and the commands without a package of their own
(generate, init-random, token-map, config, demo); imports everything below it."""
