"""The webhook intake: the ASGI app (`app`), signature checks (`webhooks`), and what a lead is
(`leads`: kinds, normalisation, and the refusal of a lead that points at a private address).
"""
