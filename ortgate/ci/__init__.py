"""Running ortgate inside CI systems (the GitHub Action's step logic lives here, where it can be tested)."""
