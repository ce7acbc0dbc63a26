"""`pdserve profile`: measure the real engine and transports on this host and write a profile.

`plan` (which points, pure) -> `transfer_probe` (real transports over loopback) and
`engine_probe` (a real vLLM engine) -> `job` (progress bar, the profile file, the fit, a plot).
"""
