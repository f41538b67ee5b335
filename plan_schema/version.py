"""Version numbers of the .cgplan format and of the producer.

FORMAT_MAJOR changes when an older runtime would misread a newer plan (it then refuses the
file); FORMAT_MINOR changes when fields are added that older runtimes may ignore.
"""

from __future__ import annotations

__all__ = ["FORMAT_MAJOR", "FORMAT_MINOR", "CGC_VERSION", "PRODUCER", "MAGIC"]

FORMAT_MAJOR = 1
FORMAT_MINOR = 8  # 1: ClassRef.pickled_class; 2: Program.wake_depth; 3: ExternalActor.placement;
# 4: Node.cuda_graph, Program.captured_ops; 5: Communicator.backend gone (field 2 reserved: the
# runtime binds transports from placement). A 1.4 runtime refuses a 1.5 plan that has
# communicators (its structure check asks for a backend); 1.5 reads 1.4 plans (the old field
# is an unknown one, kept as is). 6: TransportHint.requested (a Ray RDT transport's name, shown
# in the edge's reason; older runtimes ignore it). 7: Graph.weight_syncs, Lowered.transfers (a
# weight sync's transfer plan); Collective.concat (Ray's allgather from a Ray DAG: one tensor).
# 1.7 reads older plans (no syncs, no concat); a 1.6 runtime refuses a 1.7 plan with a sync at
# start (its actors have no method "cgc.sync.send"), but would hand a concat allgather's
# consumers the list instead of one tensor (concat is set only by the Ray drop-in, which
# compiles and runs in one process, one version). 8: PlanHeader.class_modules and
# lists_class_modules (the modules of the classes the graph names, so that an untrusted plan
# is refused from its header; a 1.8 reader refuses a 1.8 plan whose header list differs from
# its graph's). 1.8 reads older plans (no list: trust decided from the graph, as before); a
# 1.7 runtime ignores the list (unknown header fields) and decides from the graph.
CGC_VERSION = "0.1.0"
PRODUCER = f"cgc {CGC_VERSION}"
# PNG-style magic: the high byte catches 7-bit transfers, the newline catches text-mode ones.
MAGIC = b"\x89CGPLAN\n"
