"""Profile files shipped with pdserve: the example profile and its generator."""
