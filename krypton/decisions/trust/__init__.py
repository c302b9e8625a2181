"""How far krypton believes what it reads and what it prints: its release records and their
guard, the writers of a release, Leases, bounded YAML, credentials kept out of output, text
safe to print. Pure.
"""
