"""Workers: a step's device work (plain, EAGLE v1/v2 trees, MTP chains) over a schedule plan;
they import the engine loop's plan and protocol, adapters through their ports, never the
composition."""
