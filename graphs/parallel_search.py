"""The ParallelSearch graph for LangGraph Studio (``langgraph dev``).

Runs on the embedded defaults (Qwen2.5-Coder-0.5B-Instruct with the trained adapter of the mode, BM25 over the
embedded Wikipedia summaries) with no key and no network. Studio shows the context schema (``Context``: every
``AgentConfig`` field); a run sets ``llm``, ``corpus``, ``mode``, ``protocol``, ``max_turns``, ``topk``, … in its
``context`` (or ``configurable``, which the server passes on as the context).
"""

from ps_agent.graph import graph

__all__ = ["graph"]
