"""Local backends the gateway launches itself: the supervisor that starts and follows
them, and the board that tells every worker where they are."""
