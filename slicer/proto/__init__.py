"""Generated gRPC code for the kubelet's plugin registration and DRA plugin services.

Do not edit the ``*_pb2*`` files: change the ``.proto`` files and run
``python -m gpu_slicer.slicer.proto.generate``.
"""
