"""The ParallelSearch graph for LangGraph Server and Studio (``langgraph dev``).

Runs on the embedded defaults (Qwen2.5-Coder-0.5B-Instruct with the trained adapter of the mode, BM25 over the
embedded Wikipedia summaries) with no key and no network. Studio shows the context schema: every setting, with
``llm`` and ``corpus`` as the names this server offers. A client sets them in its run's ``context`` (or
``configurable``); the operator names the models and corpora on offer in ``PS_AGENT_ALLOWED_LLMS`` and
``PS_AGENT_ALLOWED_CORPORA`` (docs/serving.md).
"""

from ps_agent.serving import served_graph

graph = served_graph()

__all__ = ["graph"]
