"""Test doubles that stand in for real infrastructure in the fast unit tier."""
