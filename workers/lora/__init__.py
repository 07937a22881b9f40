"""LoRA adapters: PEFT loading, slots of preallocated weights, and the grouped delta."""
