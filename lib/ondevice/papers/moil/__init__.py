"""moil"""
