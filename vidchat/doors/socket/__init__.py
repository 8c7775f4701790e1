"""socket"""
