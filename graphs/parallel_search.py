"""The ParallelSearch graph for LangGraph Studio (``langgraph dev``).

Runs on the embedded defaults (SmolLM2-135M-Instruct with the trained adapter of the mode, BM25 over the
embedded Wikipedia summaries) with no key and no network. Per run, ``configurable`` may set ``llm``, ``corpus``,
``mode``, ``protocol``, ``max_turns``, ``topk`` and any other ``AgentConfig`` field.
"""

from ps_agent.graph import build_graph

graph = build_graph()
