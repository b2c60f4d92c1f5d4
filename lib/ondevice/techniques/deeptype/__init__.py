"""techniques/deeptype"""
