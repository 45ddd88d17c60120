"""One collection, step by step (`collect`: plan, fetch, parse, store), the one door every request
goes through (`fetcher`), what an answer means (`classify`), the fetch log's event (`events`), and
what one run works through (`runwork`).
"""
