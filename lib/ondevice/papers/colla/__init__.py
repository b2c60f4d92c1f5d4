"""colla"""
