"""engine/kernels"""
