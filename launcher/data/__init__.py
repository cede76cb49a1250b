"""Training data: find and read the user's files, tokenize and pack them into fixed-length blocks (cached), and the
order the ranks see them in.
"""
