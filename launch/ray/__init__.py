"""pdserve on a Ray cluster: the router, the prefill pool and the decode pool as Ray actors.

    spec.py        what the cluster is made of (pure values: resources, commands)
    scaling.py     which members to add or remove to reach a pool size (pure)
    child.py       one owned subprocess tied to its owner's life (no Ray)
    member.py      the actor around one `pdserve worker|router` (or redis-server) process
    controller.py  the named actor that owns every member; add, remove, scale, shutdown
    auth.py        which Ray authentication token a driver sends, what to say when refused (pure)
    connect.py     connecting a driver to the Ray cluster: token, a fast probe, ray.init
    cluster.py     `RayCluster`, the driver-side handle with `LocalCluster`'s interface
    options.py/up.py  `pdserve up --ray ADDRESS`

The guide for operators is deploy/ray/README.md.
"""
