"""engine/model"""
