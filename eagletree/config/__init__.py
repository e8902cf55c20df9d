"""Configuration: typed settings and the eagle-family resolution rules."""
