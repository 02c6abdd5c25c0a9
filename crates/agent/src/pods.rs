//! Pods bound to this node: one worker per pod drives its sandbox and containers through CRI.
