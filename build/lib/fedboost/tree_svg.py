"""One tree's structure as an SVG drawing (for ``fedboost report``).

Nodes sit on rows by depth; a node's x is the mean of its leaves' positions (leaves evenly
spaced left to right). Each node's text comes from the caller, who decides what the report's
party may see (its own features by name, other parties' as ``party:feature#k``).
"""

from __future__ import annotations

from collections.abc import Callable
from html import escape

from boosting.tree import Tree, TreeNode

LEAF_WIDTH, ROW_HEIGHT, BOX_HEIGHT = 118, 64, 34
SPLIT_FILL, LEAF_FILL = "#dbe9f6", "#f3f3f3"


def tree_svg(tree: Tree, label: Callable[[TreeNode], tuple[str, str]], chart_id: str) -> str:
    """An ``<svg class="tree-chart">`` of ``tree``; ``label(node)`` gives two lines of text."""
    nodes = {n.id: n for n in tree.nodes}
    x: dict[int, float] = {}
    depth: dict[int, int] = {}
    leaves = 0

    def place(node_id: int, level: int) -> float:
        nonlocal leaves
        node = nodes[node_id]
        depth[node_id] = level
        if node.is_leaf:
            x[node_id] = leaves + 0.5
            leaves += 1
        else:
            x[node_id] = (place(node.left, level + 1) + place(node.right, level + 1)) / 2
        return x[node_id]

    place(tree.nodes[0].id, 0)
    width = max(1, leaves) * LEAF_WIDTH
    height = (max(depth.values()) + 1) * ROW_HEIGHT + 10
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="tree-chart" id="{escape(chart_id)}" '
           f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
           f'font-family="sans-serif" font-size="10">',
           f'<rect width="{width}" height="{height}" fill="#ffffff"/>']

    def centre(node_id: int) -> tuple[float, float]:
        return x[node_id] * LEAF_WIDTH, depth[node_id] * ROW_HEIGHT + 6 + BOX_HEIGHT / 2

    for node in tree.nodes:  # edges first, under the boxes
        if node.is_leaf or node.id not in x:
            continue
        px, py = centre(node.id)
        for child, colour in ((node.left, "#2c7fb8"), (node.right, "#d95f0e")):
            cx, cy = centre(child)
            out.append(f'<line x1="{px:.1f}" y1="{py:.1f}" x2="{cx:.1f}" y2="{cy:.1f}" '
                       f'stroke="{colour}" stroke-width="1.5"/>')
    for node in tree.nodes:
        if node.id not in x:
            continue
        cx, cy = centre(node.id)
        first, second = label(node)
        kind = "leaf" if node.is_leaf else "split"
        box = LEAF_WIDTH - 8
        out.append(f'<g class="tree-node {kind}"><rect x="{cx - box / 2:.1f}" '
                   f'y="{cy - BOX_HEIGHT / 2:.1f}" width="{box}" height="{BOX_HEIGHT}" rx="4" '
                   f'fill="{LEAF_FILL if node.is_leaf else SPLIT_FILL}" stroke="#888"/>'
                   f'<text x="{cx:.1f}" y="{cy - 3:.1f}" text-anchor="middle">'
                   f'{escape(_fit(first))}</text><text x="{cx:.1f}" y="{cy + 10:.1f}" '
                   f'text-anchor="middle" fill="#555">{escape(_fit(second))}</text></g>')
    out.append("</svg>")
    return "".join(out)


def _fit(text: str, most: int = 22) -> str:
    return text if len(text) <= most else text[:most - 1] + "\u2026"
