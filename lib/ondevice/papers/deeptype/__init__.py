"""deeptype"""
