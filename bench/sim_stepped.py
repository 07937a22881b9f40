"""A simulated worker that runs the engine's step loop (``Cluster(..., stepped=True)``).

``bench.sim.SimWorker`` reduces the engine to per-request timings (one prefill at a
time, a decode's duration fixed when it starts), cheap enough for a million requests
on 256 workers. This worker steps as ``workers.engine.scheduler`` schedules: under a
budget of ``max_batched_tokens`` per step, running decodes first (one token each),
then running prefills (chunked), then waiting requests admitted in FIFO order while
fewer than ``max_num_seqs`` run, their prefix matched at admission; the step costs
``CostModel.step_s`` over its entries, and its tokens appear when it ends. A request
arriving mid-step waits for the step to end, as it does in the engine. Slower than
``SimWorker`` by the number of steps; ``bench.sim_check`` uses it to compare with the
timed cluster. Not modelled: preemption (the capacity is the KV cache's, never the
running sequences' blocks) and commits before a prompt's prefill ends.
"""

from __future__ import annotations

from bench.sim import Job, SimWorker


class SteppedSimWorker(SimWorker):
    """``SimWorker``'s cache, counters and load report over the engine's step loop."""

    def __init__(self, index: int, cluster) -> None:
        super().__init__(index, cluster)
        # [job, prompt tokens computed, output tokens produced], oldest first
        self.running: list[list] = []
        self.stepping = False

    def load(self) -> tuple[int, int, int, float, None]:
        """Running and waiting requests, prompt tokens still to prefill, KV usage."""
        uncomputed = sum(job.request.num_prompt_tokens - done for job, done, _ in self.running)
        return (len(self.running), len(self.queue), self.num_waiting_tokens + uncomputed,
                self.cache.tree.num_tokens() / self.config.kv_capacity_tokens, None)

    def admit(self, job: Job) -> None:
        """Queue ``job``; start a step if the engine is idle."""
        self.num_requests += 1
        self.num_waiting_tokens += job.request.num_prompt_tokens
        self.queue.append(job)
        if not self.stepping:
            self._step()

    def _step(self) -> None:
        budget, entries, chunks = self.config.max_batched_tokens, [], []
        decodes = [s for s in self.running if s[1] == s[0].request.num_prompt_tokens]
        prefills = [s for s in self.running if s[1] < s[0].request.num_prompt_tokens]
        for state in decodes + prefills:
            if budget == 0:
                break
            job, done, produced = state
            prompt = job.request.num_prompt_tokens
            n = 1 if done == prompt else min(prompt - done, budget)
            entries.append((n, (done + n) if done < prompt else prompt + produced))
            chunks.append((state, n))
            budget -= n
        while self.queue and budget > 0 and len(self.running) < self.config.max_num_seqs:
            job = self.queue.popleft()
            request = job.request
            self.num_waiting_tokens -= request.num_prompt_tokens
            cached = min(self.cache.match(request.prompt, request.tenant), request.num_prompt_tokens - 1)
            job.num_cached_tokens = cached
            state = [job, cached, 0]
            self.running.append(state)
            n = min(request.num_prompt_tokens - cached, budget)
            entries.append((n, cached + n))
            chunks.append((state, n))
            budget -= n
        if not chunks:
            self.stepping = False
            return
        self.stepping = True
        step_s = self.config.cost.step_s(entries)
        self.busy_s += step_s
        self.cluster.at(self.cluster.now + step_s, lambda: self._end_step(chunks))

    def _end_step(self, chunks: list[tuple[list, int]]) -> None:
        for state, n in chunks:
            job = state[0]
            request = job.request
            if state[1] < request.num_prompt_tokens:
                state[1] += n
                if state[1] < request.num_prompt_tokens:
                    continue
                self.cluster.deliver(self, self.cache.insert(request.prompt, request.tenant,
                                                             request.num_public_tokens))
                self.cluster.first_token(job)
            state[2] += 1
            if state[2] == request.num_output_tokens:
                self.running.remove(state)
                self.cluster.deliver(self, self.cache.insert(request.prompt + request.output,
                                                             request.tenant, request.num_public_tokens))
                self.cluster.finish(job)
        self._step()
