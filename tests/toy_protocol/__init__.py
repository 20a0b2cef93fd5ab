"""A toy fifth protocol that lives only here: federated mean boosting.

Members hold rows with a label; each round every member sends the aggregator the sum of its
rows' squared-loss gradients and its row count, and the aggregator sends back one leaf value
``-learning_rate * G / N`` that every member adds to its prediction (a depth-0 tree). It shows
how a protocol plugs into fedboost without editing it (docs/protocols.md, "How to add a
protocol"): its messages (``messages``), its declaration, schema and flow (``protocol``,
``flow``) and its worker steps (``steps``), found through ``FEDBOOST_PROTOCOLS=tests.toy_protocol``.
"""
