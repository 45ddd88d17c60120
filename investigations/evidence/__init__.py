"""What the fleet keeps as proof: records as Parquet (`records`), the answers they were read from as
WARC captures (`captures`), case packages and their verification (`casepackage`), and the
canonical JSON they hash (`canonical`).
"""
