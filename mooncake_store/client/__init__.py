"""The client SDK: AsyncClient (the logic) and Client (a synchronous facade over it)."""
