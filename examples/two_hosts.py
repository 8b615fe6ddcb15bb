"""Two hosts on a local Ray cluster: one graph, its branches run on two Ray nodes at once.

    Tokens >> (Embed.at("gpu-box") | Count.at("cpu-box"))

The script starts its own cluster — a head and one Ray node per host, each offering the custom
resource that names its host (`soma-host:gpu-box`, `soma-host:cpu-box`: the one rule from a
host to Ray) — runs the graph, checks the result against the same graph run here, prints the
distributed plan, which Ray node ran each placed node and the spans the hosts traced, and shuts
the cluster down. On a real cluster, start each machine's node with
`ray start --resources='{"soma-host:<name>": 1}'` instead, and connect with
`ray.init(address="auto")`. Needs Ray: `pip install 'soma-graph[ray]'`.
"""

import numpy as np
import ray
from ray.cluster_utils import Cluster

import soma
from soma.remote import resource_of


class Tokens(soma.Node):
    def forward(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode(), dtype=np.uint8).astype(np.float64)


class Embed(soma.Node):
    """Stands for a model on a GPU box: a projection of the tokens, and where it ran."""

    def forward(self, tokens: np.ndarray) -> tuple[float, str]:
        weights = np.linspace(0.0, 1.0, tokens.size)
        return float(tokens @ weights), ray.get_runtime_context().get_node_id()


class Count(soma.Node):
    def forward(self, tokens: np.ndarray) -> tuple[int, str]:
        return int(tokens.size), ray.get_runtime_context().get_node_id()


def main() -> None:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        nodes = {
            host: cluster.add_node(num_cpus=1, resources={resource_of(host): 1}).node_id
            for host in ("gpu-box", "cpu-box")
        }
        ray.init(address=cluster.address, log_to_driver=False)
        g = soma.Graph.somatize(Tokens() >> (Embed().at("gpu-box") | Count().at("cpu-box")))
        print(g.distributed_plan())
        trace = soma.Trace()
        ran = g.forward("beyond one machine", trace=trace)
        for node, host in g.hosts().items():
            value, node_id = ran[node]
            where = "the node of " + host if node_id == nodes[host] else "elsewhere"
            print(f"{node} = {value:.3f} ran on {where}")
            assert node_id == nodes[host]
        # The hosts shipped their nodes' spans back: each on a track of its own, marked.
        for span in trace.spans:
            if span.host is not None:
                print(f"traced {span.node} on host {span.host}: {span.duration * 1e6:.0f} µs")
        for node in g.nodes():
            g.place_at(node, None)
        here = g.forward("beyond one machine")
        assert {k: v for k, (v, _) in ran.items()} == {k: v for k, (v, _) in here.items()}
        print("the same results as the local run")
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main()
