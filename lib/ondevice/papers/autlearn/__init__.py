"""autlearn"""
