"""A tiny model compiled with fullgraph=True whose forward indexes, copies and selects: the same
graphs and graph breaks under run as under python. The backend is aot_eager: Dynamo traces the
forward (the graphs and breaks counted) and AOTAutograd traces it and its backward with fake
tensors through run's read hooks, as inductor would, without inductor's C++ compile (a minute of
a test's time on two cores)."""

import torch
import torch._dynamo.utils


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.layer(x.to(torch.float32))
        y = torch.where(y > 0, y, y * 0.1)
        return y[:, :2].cpu()


torch.manual_seed(0)
model = Tiny()
model.compile(fullgraph=True, backend="aot_eager")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    loss = model(torch.ones(3, 4)).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
print(sorted(torch._dynamo.utils.counters["stats"].items()))
print(sorted(torch._dynamo.utils.counters["graph_break"].items()))
print(f"{loss.item():.5f}")
