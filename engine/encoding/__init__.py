"""engine/encoding"""
