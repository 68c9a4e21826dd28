"""consumer/pipeline"""
