"""What goes to Dagster, when: the dispatcher (`dispatch`: bounds, batches, circuits, budgets,
staggering), priority classes and their tags (`priority`), and spend against budgets (`cost`).
"""
